"""Code search family: walker, chunker, embedder, store, indexer, query; MCP registration in adapter.py."""
