from paw_lightning.callbacks.balancing import FixedLambda, LossBalancer, RewardAdaptiveLambda
from paw_lightning.callbacks.summary import RunSummary
from paw_lightning.callbacks.warmup import BehaviourCloningWarmup

__all__ = ["BehaviourCloningWarmup", "FixedLambda", "LossBalancer", "RewardAdaptiveLambda", "RunSummary"]
