-- release: take one token out of its client's outstanding count and the anonymous budget
-- (Redis Cluster, where the token's record and the limit records live in different slots:
-- consume, begin and revoke return the bucket instead of releasing it themselves).
-- KEYS[1] the client's limit record; KEYS[2] (optional) the budget's (the same slot: the
-- '{l}' of their keys); ARGV[1] the bucket (field 6 of the ISSUED record, see _record.lua)
-- returns {'released'}
release_bucket(ARGV[1], KEYS[1], KEYS[2])
return {'released'}
