"""What the server tells about itself: Prometheus metrics, statistics, latency quantiles, tracing
and resource sampling.
"""
