"""Worker output: captured, passed through unchanged, and turned into log records."""
