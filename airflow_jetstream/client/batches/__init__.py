"""Atomic batches, fast batches and the client-side Batcher."""
