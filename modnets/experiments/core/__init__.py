"""What every experiment shares: training and checkpoints by key (``harness``, ``fingerprints``),
summaries over seeds (``stats``), the rules that decide claims and their log (``rule``,
``rules``), the claims themselves (``claims``), results files (``results``), the reproduction
report (``report``), the GPU budget (``budget``) and the command line (``cli``)."""
