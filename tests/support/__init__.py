"""What the tests share: models, program strategies, gradient checks, paths and NumPy comparisons."""
