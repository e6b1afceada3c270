"""Serving engines: vLLM run and planned by gpubox so many clients share one box, and any OpenAI-compatible
server attached by URL; infer_* requests for a served model go to its engine."""
