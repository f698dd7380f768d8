"""Scripted stand-ins for real servers, used where a real one cannot produce an exact case."""
