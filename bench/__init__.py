"""ge-serve's benchmark suites, one entry point:

    python -m bench list                      # the suites and what each measures
    python -m bench run SUITE [options]       # e.g. python -m bench run batching --help

bench/lib/ holds the harness the suites share (servers, perf_analyzer, raw onnxruntime,
the time-shared runner, reports); bench/suites/ one small module per suite; bench/results/
the latest result of each, listed in bench/RESULTS.md with the command that produced it.
"""
