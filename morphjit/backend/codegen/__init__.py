"""backend/codegen"""
