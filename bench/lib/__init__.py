"""The bench harness the suites share: servers (server), perf_analyzer (perfa), fixed valid
inputs (inputs), generated models and repositories (models), server configurations
(variants), raw onnxruntime (raw_ort, raw_worker), the time-shared runner and its summaries
(timeshare, timeshare_summary), the perf_analyzer latency profile (sweep), a mixed-priority
load generator (loadgen) and tables and plots (report)."""
