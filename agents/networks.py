"""Network and optimizer factories shared by the agents."""

import tensorflow as tf
from tf_agents.networks import encoding_network, network

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


class DuelingQNetwork(network.Network):
    """Q(s, a) = V(s) + A(s, a) - mean_a A(s, a) on a shared encoder (Wang et al. 2016).

    Why: DrQ(epsilon), whose Atari-100k settings configs/dqn_atari100k.gin follows, uses
    Dopamine's dueling head: the encoder (convolutions, then the `fc_layer_params`
    hidden layers) feeds two linear heads, one value and one advantage per action.
    Subtracting the mean advantage makes V and A identifiable; the argmax is A's.
    The heads start like TF-Agents' QNetwork's output layer (small uniform kernels),
    so a dueling network starts with the same spread of Q-values as a plain one.
    """

    def __init__(self, input_tensor_spec, action_spec, preprocessing_layers=None,
                 conv_layer_params=None, fc_layer_params=(512,), name='DuelingQNetwork'):
        action_spec = tf.nest.flatten(action_spec)[0]
        num_actions = int(action_spec.maximum - action_spec.minimum + 1)
        super().__init__(input_tensor_spec=input_tensor_spec, state_spec=(), name=name)
        self._encoder = encoding_network.EncodingNetwork(
            input_tensor_spec, preprocessing_layers=preprocessing_layers,
            conv_layer_params=conv_layer_params, fc_layer_params=fc_layer_params,
            batch_squash=True)

        def head(units, layer_name):
            return tf.keras.layers.Dense(
                units, kernel_initializer=tf.random_uniform_initializer(-0.03, 0.03),
                name=layer_name)

        self._value_head = head(1, 'value')
        self._advantage_head = head(num_actions, 'advantage')

    def call(self, observation, step_type=None, network_state=(), training=False):
        state, network_state = self._encoder(
            observation, step_type=step_type, network_state=network_state, training=training)
        value = self._value_head(state, training=training)
        advantage = self._advantage_head(state, training=training)
        q_values = value + advantage - tf.reduce_mean(advantage, axis=-1, keepdims=True)
        return q_values, network_state
