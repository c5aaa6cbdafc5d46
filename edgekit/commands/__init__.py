"""Command-line verbs: argparse and printing only, one module per verb. Only ``edgekit.cli`` imports these."""
