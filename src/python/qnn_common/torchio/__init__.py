"""Torch files in and out, foreign ones included, without running code from them."""
