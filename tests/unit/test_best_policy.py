"""policy_best/ follows the documented rule through a scripted run, across a resume."""

import json
import os

import tensorflow as tf
from tf_agents.environments import tf_py_environment
from tf_agents.policies import fixed_policy

from envs.suite import make_env
from experiment.best_policy import BEST_DIR, BEST_FILE, BestPolicy, read_best


def _exported_train_step(root_dir):
    return int(tf.saved_model.load(os.path.join(root_dir, BEST_DIR)).get_train_step().numpy())


def test_candidates_replace_the_best_only_when_confirmed_strictly_better(tmp_path):
    root = str(tmp_path)
    env = tf_py_environment.TFPyEnvironment(make_env('CartPole-v1'))
    policy = fixed_policy.FixedPolicy(tf.constant(0, tf.int64), env.time_step_spec(),
                                      env.action_spec())
    train_step = tf.Variable(0, dtype=tf.int64)
    confirmations = []
    scripted = iter([8.0, 8.0, 15.0, 14.0, 16.0])  # what each confirmation scores

    def confirm():
        confirmations.append(int(train_step.numpy()))
        return [next(scripted)] * 4

    def keeper():
        return BestPolicy(root, policy, train_step, confirm, say=lambda text: None)

    best = keeper()
    # (env step, periodic eval return, replaced?): train step = env step / 10 here.
    first_half = [(100, 10.0, True),    # no best yet: confirmed at 8, exported
                  (200, 7.0, False),    # eval below 8: not even a candidate
                  (300, 12.0, False),   # candidate; confirmed 8 is a tie: the best stays
                  (400, 20.0, True)]    # confirmed 15 > 8: replaced
    second_half = [(500, 15.0, False),  # eval 15 is not above the confirmed 15
                   (600, 30.0, False),  # candidate; confirmed 14 < 15
                   (700, 31.0, True)]   # confirmed 16 > 15: replaced
    for step, eval_return, replaced in first_half:
        train_step.assign(step // 10)
        assert best.consider(step, eval_return) == replaced, step
    assert read_best(root)['env_step'] == 400 and _exported_train_step(root) == 40

    best = keeper()  # a resumed process reads the kept best from disk
    assert best.best['confirmed_return'] == 15.0
    for step, eval_return, replaced in second_half:
        train_step.assign(step // 10)
        assert best.consider(step, eval_return) == replaced, step
    assert confirmations == [10, 30, 40, 60, 70]
    with open(os.path.join(root, BEST_DIR, BEST_FILE)) as f:
        kept = json.load(f)
    assert kept == {'env_step': 700, 'train_step': 70, 'eval_return': 31.0,
                    'confirmed_return': 16.0, 'confirmation_episodes': 4}
    assert _exported_train_step(root) == 70
    assert not os.path.exists(os.path.join(root, BEST_DIR + '.tmp'))
