"""Benchmark modules for bench.py; each exposes add_arguments(parser) and run(args)."""
