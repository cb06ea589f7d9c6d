-- release: take one token out of its client's outstanding count (Redis Cluster, where
-- the token's record and the client's limit record live in different slots: consume,
-- begin and revoke return the bucket instead of releasing it themselves).
-- KEYS[1] the client's limit record; ARGV[1] the bucket
-- returns {'released'}
release_from(KEYS[1], ARGV[1])
return {'released'}
