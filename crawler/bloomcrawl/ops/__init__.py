"""Operations: the CLI, the exporter, cluster inspection, the demo site. Never in the egg."""
