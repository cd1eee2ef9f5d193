"""levanter-mars: the MARS optimizer (arXiv 2411.10438) on Levanter."""
