"""Helpers the cross-package test suites share (instead of a copy per test file)."""
