"""The command line and process set-up: settings and flags, each part's settings, malloc tuning,
and how the process exits.
"""
