"""The engine: the model loops and what they need, and nothing about constraints.

- :mod:`~dgemma_struct.engine.forward` — the encoder/decoder calls and a CUDA-aware clock;
- :mod:`~dgemma_struct.engine.sampler` — the entropy-bound acceptance rule and canvas noise;
- :mod:`~dgemma_struct.engine.canvas` / :mod:`~dgemma_struct.engine.canvas_steps` — the block-diffusion
  loop (one batch road: :class:`~dgemma_struct.engine.canvas.CanvasBatch`, rows join and leave);
- :mod:`~dgemma_struct.engine.autoregressive` — the left-to-right loop on the same weights (``ARBatch``);
- :mod:`~dgemma_struct.engine.hooks` — the per-step hook through which the guide steers a loop;
- :mod:`~dgemma_struct.engine.token_logprobs` — per-token log-probabilities recorded by a hook;
- :mod:`~dgemma_struct.engine.profiling` — host-sync and allocation probes;
- :mod:`~dgemma_struct.engine.model_config` — the project's DiffusionGemma configurations.

The engine never imports ``guide``, ``constraints``, ``repair``, ``scheduling``, the verbs or the
server (``tests/test_architecture.py``). The face re-exports nothing, so importing one engine module
does not import the others.

Example::

    >>> from dgemma_struct.engine.sampler import DiffusionSettings
    >>> DiffusionSettings().max_denoising_steps > 0
    True
"""
