"""The performance suite of token-service: ``python -m benchmarks`` (see benchmarks/README.md).

Every figure is a ratio against a baseline measured in the same run, on the
same machine, alternating A B A B and taking medians: the machines this runs on
are shared and noisy, so an absolute number alone means little.
"""
