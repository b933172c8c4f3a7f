"""api/scipy"""
