from paw_lightning.callbacks.balancing import FixedLambda, RewardAdaptiveLambda

__all__ = ["FixedLambda", "RewardAdaptiveLambda"]
