"""The model repository and its lifecycle: finding, configuring, loading, swapping and unloading
model versions; ensembles; version health.
"""
