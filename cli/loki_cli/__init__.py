"""The ``loki`` command and the embedded stack it runs (see :mod:`loki_cli.stack`)."""
