"""Normalised-AST similarity: near-duplicate removal and decontamination against evaluation programs."""
