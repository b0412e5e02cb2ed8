"""Frame codecs on real Atari frames: bytes per frame, encode and decode time (one core).

    .venv/bin/python -m bench.frame_codecs --output docs/frame_codecs.md
    .venv/bin/python -m bench.run_all --only frame_codecs     # the same, as a make bench section

The measurement behind FrameStackedReplay's codec choice (buffers/frames.py): 2,000 frames
of random play per game (ale-py, 84x84 grayscale, frame skip 4), each codec encoding and
decoding them one at a time as replay does (encode once per env step; decode once per frame
of every sampled window). zstd is not a dependency of this project and is not measured here.
"""

import datetime
import sys
import zlib

from bench import inprocess, timing

GAMES = ('ALE/Pong-v5', 'ALE/Breakout-v5', 'ALE/Boxing-v5')
FRAMES = 2_000


def _codecs():
    import lz4.block
    import numpy as np
    import tensorflow as tf

    def lz4_codec(**options):
        return (lambda raw: lz4.block.compress(raw, store_size=False, **options),
                lambda blob: lz4.block.decompress(blob, uncompressed_size=84 * 84))

    def tf_image(encode, decode):
        return (lambda raw: encode(np.frombuffer(raw, np.uint8).reshape(84, 84, 1)).numpy(),
                lambda blob: decode(blob).numpy())

    return {
        'zlib level 1': (lambda raw: zlib.compress(raw, 1), zlib.decompress),
        'LZ4 fast': lz4_codec(),
        'LZ4 HC level 3 (default)': lz4_codec(mode='high_compression', compression=3),
        'LZ4 HC level 9': lz4_codec(mode='high_compression', compression=9),
        'PNG (tf.io)': tf_image(tf.io.encode_png, tf.io.decode_png),
        'JPEG q95 (tf.io, lossy)': tf_image(lambda f: tf.io.encode_jpeg(f, quality=95),
                                            tf.io.decode_jpeg),
    }


def measure():
    from bench.atari_replay import _frames
    from core.quiet import quiet_startup
    from core.tf_setup import configure_tf
    quiet_startup()
    configure_tf(0, 1)
    codecs = _codecs()
    results = {}
    for game in GAMES:
        frames = [t.observation[0].tobytes() for t, _ in _frames(game, FRAMES)]
        for name, (encode, decode) in codecs.items():
            blobs = []

            def decode_all():  # each frame dropped at once, as replay's decode drops it
                for blob in blobs:
                    decode(blob)
            # One timed call per pass over all frames: a clock read per frame would show.
            [encode_s] = inprocess.timed_calls(lambda: blobs.extend([encode(f) for f in frames]),
                                               calls=1, warmup=0)
            [decode_s] = inprocess.timed_calls(decode_all, calls=1, warmup=0)
            results.setdefault(name, {})[game] = (sum(map(len, blobs)) / len(blobs),
                                                  encode_s / len(frames) * 1e6,
                                                  decode_s / len(frames) * 1e6)
    return results


def render(results):
    short = [game.split('/')[1].split('-')[0] for game in GAMES]
    lines = ['## Frame codecs on real Atari frames', '',
             f'Written by `python -m bench.frame_codecs` on {datetime.date.today().isoformat()}; '
             f'do not edit by hand. {FRAMES:,} frames of random play per game (84x84 grayscale, '
             'frame skip 4; a raw frame is 7,056 B), one at a time on one core.', '',
             '| codec | ' + ' | '.join(f'{game} bytes' for game in short) +
             ' | encode µs (per game) | decode µs (per game) |',
             '| --- | ' + ' | '.join('---:' for _ in short) + ' | ---: | ---: |']
    for name, per_game in results.items():
        cells = [per_game[game] for game in GAMES]
        lines.append(f'| {name} | ' + ' | '.join(f'{size:,.0f}' for size, _, _ in cells) +
                     ' | ' + ' / '.join(f'{enc:.0f}' for _, enc, _ in cells) +
                     ' | ' + ' / '.join(f'{dec:.1f}' for _, _, dec in cells) + ' |')
    return '\n'.join(lines) + '\n'


def section(opts):
    """The make-bench section (bench/run_all.py); the measurement takes about a minute."""
    return render(measure())


def main(argv=None):
    return timing.standalone_main(section, __doc__, argv)


if __name__ == '__main__':
    sys.exit(main())
