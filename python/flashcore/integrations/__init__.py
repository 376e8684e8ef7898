"""Integrations of FlashCore with other libraries (imported explicitly, e.g. flashcore.integrations.transformers)."""
