"""End-to-end tests of the command-line clients (wireproto.tools)."""
