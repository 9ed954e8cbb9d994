"""The training runtime on torch.distributed (imports torch; nothing below it may import it)."""
