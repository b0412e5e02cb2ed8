"""Network and optimizer factories shared by the agents."""

import tensorflow as tf

from core.errors import UserError

_OPTIMIZERS = {
    'adam': tf.keras.optimizers.legacy.Adam,
    'rmsprop': tf.keras.optimizers.legacy.RMSprop,
    'sgd': tf.keras.optimizers.legacy.SGD,
}


def make_optimizer(name, learning_rate, epsilon=None):
    """Builds an optimizer by name.

    The legacy Keras optimizers are used on purpose: they create their slot
    variables eagerly per variable, which keeps checkpoints restorable before
    the first gradient step and compiles under XLA inside the fused loop.
    """
    try:
        optimizer_cls = _OPTIMIZERS[name.lower()]
    except KeyError:
        raise UserError(
            f"Unknown optimizer {name!r}: choose one of "
            f"{', '.join(sorted(_OPTIMIZERS))}.") from None
    if learning_rate <= 0:
        raise UserError(f"learning_rate must be positive, got {learning_rate}.")
    if epsilon is None:
        return optimizer_cls(learning_rate=learning_rate)
    if name.lower() not in ('adam', 'rmsprop') or not epsilon > 0:
        raise UserError(f"dqn.make_agent.adam_epsilon={epsilon!r} needs optimizer 'adam' "
                        "(or 'rmsprop') and a value > 0.")
    return optimizer_cls(learning_rate=learning_rate, epsilon=epsilon)
