"""The Batch API: uploaded files, batch jobs and their per-line results, kept on disk."""
