"""A MovieLens rating model over strings of delimited ids, with tf-ctr-ops.

    python examples/movielens_sequence.py                  # generated MovieLens-like data
    python examples/movielens_sequence.py --data ratings.csv
    python examples/movielens_sequence.py --smoke          # a tiny run (CI)

`--data` reads the MovieLens-1M ratings joined with users and movies, as CSV
with the header user_id,movie_id,rating,timestamp,title,genres,gender,age,
occupation,zip (titles may be quoted). Features stay strings, as they arrive
from a log or a feature store, and the model embeds them without any
tf.strings op:

- `genres` ("Comedy|Drama"): `StringEmbedding`, hash mode, split on "|";
- the user's watch history before this rating ("2115,235,3256"): a
  `StringEmbedding` in index mode (ids parsed as integers, one table row per
  movie), mean-pooled;
- user_id, movie_id, gender, age, occupation, zip: one `MultiStringEmbedding`
  (one pack, one op for all six).

It predicts whether the rating is 4 or 5, trains briefly and prints held-out
logloss and AUC. Before training it checks both StringEmbeddings against the
TF-native composition they replace (split, convert, lookup) on a batch.
"""

import argparse
import csv
import os
import sys
import time
from dataclasses import dataclass

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tf_ctr_ops  # noqa: E402,F401  (loads the op library, registers the layers)
from tf_ctr_ops.layers import MultiStringEmbedding, StringEmbedding  # noqa: E402
# ctr_metrics: examples/, beside this file
from ctr_metrics import (agrees, exit_on_bad_data, fill_defaults, logloss, positive_int, roc_auc,  # noqa: E402
                         stratified_split)

GENRES = ["Action", "Adventure", "Animation", "Children's", "Comedy", "Crime", "Documentary", "Drama", "Fantasy",
          "Film-Noir", "Horror", "Musical", "Mystery", "Romance", "Sci-Fi", "Thriller", "War", "Western"]
AGES = ["1", "18", "25", "35", "45", "50", "56"]  # MovieLens-1M age groups
NUM_USERS, NUM_MOVIES, NUM_OCCUPATIONS = 6040, 3952, 21  # MovieLens-1M
HISTORY = 50  # most recent movies kept in the history string
ID_FEATURES = ["user_id", "movie_id", "gender", "age", "occupation", "zip"]


@dataclass
class Data:
    features: dict  # name -> object array [N] of str
    labels: np.ndarray  # float32 [N]: rating >= 4
    source: str

    def __len__(self):
        return len(self.labels)

    def take(self, rows):
        return Data({k: v[rows] for k, v in self.features.items()}, self.labels[rows], self.source)

    def tensors(self):
        return {k: tf.constant(v.astype(str)) for k, v in self.features.items()}

    def dataset(self, batch_size, shuffle_seed=None):
        ds = tf.data.Dataset.from_tensor_slices((self.tensors(), self.labels))
        if shuffle_seed is not None:
            ds = ds.shuffle(len(self), seed=shuffle_seed)
        return ds.batch(batch_size).prefetch(2)


def with_histories(users, movies, timestamps):
    """For each rating, the comma-joined movie ids its user rated before it
    (the latest HISTORY), oldest first; "" for a user's first rating."""
    order = np.lexsort((timestamps, users))
    history = np.empty(len(users), dtype=object)
    seen, previous_user = [], None
    for row in order:
        if users[row] != previous_user:
            seen, previous_user = [], users[row]
        history[row] = ",".join(seen[-HISTORY:])
        seen.append(str(movies[row]))
    return history


def load_movielens(path, max_rows=None):
    with open(path, newline="", encoding="utf-8") as f:
        rows = []
        for row in csv.DictReader(f):
            if max_rows is not None and len(rows) >= max_rows:
                break
            rows.append(row)
    if not rows:
        raise ValueError(f"{path} holds no rows")
    column = {k: np.array([r[k] for r in rows], dtype=object) for k in rows[0]}
    features = {k: column[k] for k in ID_FEATURES + ["genres"]}
    features["history"] = with_histories(column["user_id"], column["movie_id"],
                                          column["timestamp"].astype(np.int64))
    labels = (column["rating"].astype(np.int64) >= 4).astype(np.float32)
    return Data(features, labels, f"{path} ({len(rows):,} ratings)")


def generate_movielens(rows, seed=0):
    """MovieLens-1M-shaped ratings: Zipf-popular movies with 1-3 genres, users
    with a favourite genre they watch and rate higher, demographics, and
    increasing timestamps, so the history reveals the taste."""
    rng = np.random.default_rng(seed)
    movie_genres = [rng.choice(len(GENRES), size=rng.choice([1, 2, 3], p=[0.5, 0.35, 0.15]), replace=False,
                               p=np.arange(len(GENRES), 0, -1) / np.arange(len(GENRES), 0, -1).sum())
                    for _ in range(NUM_MOVIES + 1)]
    by_genre = [np.array([m for m in range(1, NUM_MOVIES + 1) if g in movie_genres[m]]) for g in range(len(GENRES))]
    quality = rng.normal(0.0, 0.6, NUM_MOVIES + 1)
    favourite = rng.integers(0, len(GENRES), NUM_USERS + 1)

    users = np.minimum(rng.zipf(1.3, rows), NUM_USERS)  # a few heavy raters, as in MovieLens
    movies = np.empty(rows, np.int64)
    from_favourite = rng.random(rows) < 0.6
    popular = np.minimum(rng.zipf(1.2, rows), NUM_MOVIES)
    for i in range(rows):
        pool = by_genre[favourite[users[i]]]
        movies[i] = pool[(popular[i] - 1) % len(pool)] if from_favourite[i] else popular[i]
    likes = np.array([favourite[u] in movie_genres[m] for u, m in zip(users, movies)])
    logits = -0.4 + 1.4 * likes + quality[movies]
    labels = (rng.random(rows) < 1.0 / (1.0 + np.exp(-logits))).astype(np.float32)
    timestamps = rng.integers(956703932, 1046454590, rows)  # the MovieLens-1M time span

    user_rng = np.random.default_rng(seed + 1)
    gender = user_rng.choice(["M", "F"], NUM_USERS + 1, p=[0.72, 0.28])
    age = user_rng.choice(AGES, NUM_USERS + 1)
    occupation = user_rng.integers(0, NUM_OCCUPATIONS, NUM_USERS + 1).astype(str)
    zipcode = np.char.mod("%05d", user_rng.integers(1000, 99999, NUM_USERS + 1))
    features = {
        "user_id": users.astype(str).astype(object),
        "movie_id": movies.astype(str).astype(object),
        "gender": gender[users].astype(object),
        "age": age[users].astype(object),
        "occupation": occupation[users].astype(object),
        "zip": zipcode[users].astype(object),
        "genres": np.array(["|".join(GENRES[g] for g in sorted(movie_genres[m])) for m in movies], dtype=object),
        "history": with_histories(users, movies, timestamps),
    }
    return Data(features, labels, f"generated ({rows:,} MovieLens-like ratings, seed {seed})")


# ---------------------------------------------------------------------------


def build_model(movie_rows, dim=16):
    inputs = {name: keras.Input(shape=(), dtype="string", name=name) for name in ID_FEATURES + ["genres", "history"]}
    genres = StringEmbedding(64, 8, delimiter="|", id_mode="hash", name="genres_embedding")(inputs["genres"])
    # Index mode: history tokens are movie ids, so the table has one row per
    # movie and an id outside it is an error, not a silent collision.
    history = StringEmbedding(movie_rows, dim, delimiter=",", id_mode="index", combiner="mean",
                              name="history_embedding")(inputs["history"])
    user, movie, gender, age, occupation, zipcode = MultiStringEmbedding(
        [NUM_USERS + 1, movie_rows, 8, 16, 32, 4096], [dim, dim, 2, 4, 4, 8],
        delimiters=",", id_modes=["hash", "index", "hash", "hash", "hash", "hash"],
        name="id_embeddings")([inputs[name] for name in ID_FEATURES])
    # How well this movie fits what the user has watched: a dot product.
    affinity = keras.ops.sum(history * movie, axis=1, keepdims=True)
    x = keras.layers.Concatenate()([genres, history, user, movie, gender, age, occupation, zipcode, affinity])
    x = keras.layers.Dense(64, activation="relu")(x)
    x = keras.layers.Dense(32, activation="relu")(x)
    liked = keras.layers.Dense(1, activation="sigmoid", name="liked")(x)
    return keras.Model(inputs, liked, name="movielens_sequence")


def composition_difference(layer, strings, delimiter, id_mode):
    """Largest |difference| between a StringEmbedding and the TF-native
    split + convert + lookup it replaces (mean pooling, empty string -> zeros)."""
    tokens = tf.strings.split(strings, delimiter)
    tokens = tf.ragged.boolean_mask(tokens, tokens != "")
    if id_mode == "index":
        ids = tf.strings.to_number(tokens, tf.int64)
    else:
        ids = tf.strings.to_hash_bucket_fast(tokens, layer.num_buckets)
    want = tf.nn.safe_embedding_lookup_sparse(layer.embeddings.value, ids.to_sparse(), combiner=layer.combiner)
    got = layer(strings)
    return float(tf.reduce_max(tf.abs(got - want)))


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", metavar="PATH", help="MovieLens ratings CSV (see above); default: generated")
    parser.add_argument("--rows", type=positive_int, help="ratings to generate, or to read at most (default: "
                        "40000 generated, the whole file)")
    parser.add_argument("--epochs", type=positive_int, help="default 2 (--smoke: 1)")
    parser.add_argument("--batch-size", type=positive_int, default=256)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--smoke", action="store_true", help="a tiny, fast run (tests); options given still hold")
    args = parser.parse_args(argv)
    defaults = dict(rows=2000, epochs=1) if args.smoke else dict(epochs=2)
    return fill_defaults(args, defaults)


def load_split(args):
    """The ratings (from --data or generated) and their (train, held-out) row indices."""
    data = load_movielens(args.data, args.rows) if args.data else generate_movielens(args.rows or 40_000, args.seed)
    return data, stratified_split(data.labels, 0.2, args.seed)


def main(argv=None):
    args = parse_args(argv)
    keras.utils.set_random_seed(args.seed)
    t_start = time.perf_counter()
    data, (train_rows, test_rows) = exit_on_bad_data(load_split, args)
    train, test = data.take(train_rows), data.take(test_rows)
    lengths = np.array([len(h.split(",")) if h else 0 for h in data.features["history"]])
    genre_counts = np.array([len(g.split("|")) for g in data.features["genres"]])
    print(f"data      {data.source}: {len(train):,} train / {len(test):,} held out, liked (rating >= 4) "
          f"{data.labels.mean():.2f}")
    print(f"features  history: {lengths.mean():.1f} movie ids per row on average (max {lengths.max()}, "
          f"{(lengths == 0).mean():.0%} empty); genres: {genre_counts.mean():.2f} per movie")

    movie_ids = [int(t) for h in data.features["history"] if h for t in h.split(",")]
    movie_ids += [int(m) for m in data.features["movie_id"]]
    movie_rows = max(NUM_MOVIES, max(movie_ids)) + 1
    model = build_model(movie_rows)
    check = data.take(np.arange(min(len(data), 512))).tensors()
    diffs = {name: composition_difference(model.get_layer(f"{name}_embedding"), check[name], delim, mode)
             for name, delim, mode in (("genres", "|", "hash"), ("history", ",", "index"))}
    print("check     StringEmbedding vs tf.strings.split + convert + safe_embedding_lookup_sparse: "
          + ", ".join(f"{name} max |diff| {d:.3g}" for name, d in diffs.items()))
    if not agrees("StringEmbedding's outputs and the TF-native composition's", max(diffs.values())):
        return 1

    model.compile(optimizer=keras.optimizers.Adam(2e-3), loss="binary_crossentropy")
    t0 = time.perf_counter()
    model.fit(train.dataset(args.batch_size, shuffle_seed=args.seed), epochs=args.epochs, shuffle=False, verbose=0)
    train_s = time.perf_counter() - t0
    probs = model.predict(test.dataset(4096), verbose=0)[:, 0]
    baseline = logloss(test.labels, np.full(len(test), train.labels.mean()))
    print(f"train     {args.epochs} epoch(s) in {train_s:.1f} s, {model.count_params():,} parameters")
    print(f"quality   held-out logloss {logloss(test.labels, probs):.4f} (constant rate: {baseline:.4f}), "
          f"AUC {roc_auc(test.labels, probs):.4f}")
    print(f"done      in {time.perf_counter() - t_start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
