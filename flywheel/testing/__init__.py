"""Test support shared by the test suite and the benchmarks: free ports, process launching, harnesses."""
