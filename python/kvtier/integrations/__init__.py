"""Integrations of kvtier with inference frameworks (each imported on its own)."""
