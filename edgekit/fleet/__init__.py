"""Fleet rollout: signed bundles in an S3-compatible object store, pulled by channel.

Host side: keys (:mod:`.keys`), detached signatures (:mod:`.signature`) and the publishing verbs'
store work through boto3 (:mod:`.publish`, the one host-only module here). Device side, stdlib
plus an Ed25519 verifier: SigV4 (:mod:`.sigv4`), AWS-style credentials (:mod:`.awsconfig`), object
reads (:mod:`.store`), channel pointers (:mod:`.channel`), one version's download and checks
(:mod:`.pull`), the local versions folder (:mod:`.local`) and the daemon's channel follower
(:mod:`.follower`).
"""
