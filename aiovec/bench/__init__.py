"""Benchmarks: aiovec against its peers (``core``) and the adaptive controller (``controller``)."""
