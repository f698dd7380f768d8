"""OpenAI-compatible ``/v1``: models, chat completions, completions, embeddings.

- :mod:`.router`: the routes;
- :mod:`.protocol`: request checks, the documented rewrites, OpenAI's error shape;
- :mod:`.exchange`: one request to the engine under one ``async with`` lease;
- :mod:`.relay`: the streamed answer, one client write per engine read;
- :mod:`.assemble`: the non-streamed answer, assembled from an upstream stream.
"""

from .router import router

__all__ = ["router"]
