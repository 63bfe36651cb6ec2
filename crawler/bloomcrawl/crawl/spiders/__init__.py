"""Spiders of the bloomcrawl project."""
