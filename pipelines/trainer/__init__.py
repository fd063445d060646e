"""Example training script package: ``python -m pipelines.trainer.train_lm``."""
