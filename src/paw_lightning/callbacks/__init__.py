from paw_lightning.callbacks.balancing import FixedLambda, LossBalancer, RewardAdaptiveLambda

__all__ = ["FixedLambda", "LossBalancer", "RewardAdaptiveLambda"]
