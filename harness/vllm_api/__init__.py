"""What a subject sees of a vLLM release's layout API (placeholder docstring, rewritten below)."""
