"""Benchmarks behind ``akadze bench ...``; each writes an optional Markdown report."""
