"""Helpers shared by the tests, the benchmarks and ``s4fs selftest`` (adversarial data
sets, the real all-MiniLM-L6-v2 model). Not needed at run time."""
