"""Fashion-MNIST training helpers for the checkpoints wbfe ships in ``fixtures/``.

``data`` reads the IDX files of the Debian package ``dataset-fashion-mnist``; ``models`` holds the
architectures (MLPs and small CNNs, named so the head is always ``classifier``); ``train`` is a
seeded, deterministic trainer that reports test accuracy and mean test cross-entropy.
Nothing here is imported by ``wbfe`` itself.
"""
