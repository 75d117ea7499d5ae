"""Benchmark suites: each module here is one suite with ``DESCRIPTION`` and ``run(ctx) -> SuiteResult``."""
