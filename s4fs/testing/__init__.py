"""Adversarial data sets shared by the tests, the benchmarks and ``s4fs selftest``.
(The real all-MiniLM-L6-v2 payload of the tests and benchmarks is bench/_minilm.py,
outside the package.)"""
