"""The Files and Batches APIs: the Batch API's parts, in-process line calls, wire models."""
