"""Measured recall of random vector pairs at a cosine, against the binomial model."""
import math, numpy as np, neardup
rng = np.random.default_rng(0)
pairs, d = 2000, 384
print("| cosine | bits | k | model P[h <= k] | measured |")
print("|---|---|---|---|---|")
for cos in (0.9, 0.95, 0.97, 0.98, 0.99):
    theta = math.acos(cos)
    a = rng.standard_normal((pairs, d)); r = rng.standard_normal((pairs, d))
    r -= (r * a).sum(1, keepdims=True) / (a * a).sum(1, keepdims=True) * a
    a /= np.linalg.norm(a, axis=1, keepdims=True); r /= np.linalg.norm(r, axis=1, keepdims=True)
    b = math.cos(theta) * a + math.sin(theta) * r
    for bits in (64, 128):
        k = bits // 8
        x = np.bitwise_xor(neardup.fingerprint_vectors(a, bits=bits), neardup.fingerprint_vectors(b, bits=bits)).reshape(pairs, -1)
        h = np.array([sum(bin(int(w)).count("1") for w in row) for row in x])
        p = theta / math.pi
        model = sum(math.comb(bits, i) * p**i * (1 - p)**(bits - i) for i in range(k + 1))
        print(f"| {cos} | {bits} | {k} | {model:.3f} | {(h <= k).mean():.3f} |")
