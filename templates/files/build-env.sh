# Sourced at the start of every RUN that reaches the network (rlbox templates).
# The CA bundle comes in as a BuildKit secret (`rlbox build --ca-bundle FILE`), mounted at
# /run/secrets/ca for that one RUN only: it never lands in a layer.
if [ -s /run/secrets/ca ]; then
    export PIP_CERT=/run/secrets/ca GIT_SSL_CAINFO=/run/secrets/ca SSL_CERT_FILE=/run/secrets/ca \
        REQUESTS_CA_BUNDLE=/run/secrets/ca CURL_CA_BUNDLE=/run/secrets/ca
fi
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore
# The source cache (`rlbox fetch-sources`), bind-mounted from the build context: each RUN mounts
# only the paths it reads (its debs/ARCH/, wheels/ARCH-pyX.Y/, git/ or sdist/ entry), at the same place
# below RLBOX_SOURCES. With RLBOX_OFFLINE=1 every script installs from it alone; the build then runs
# without a network.
export RLBOX_SOURCES=/opt/rlbox/sources
rlbox_offline() { [ "${RLBOX_OFFLINE:-}" = 1 ]; }
rlbox_missing_source() {
    echo "rlbox error: offline build: $1 is not in the source cache; run \`rlbox fetch-sources\` for this image first" >&2
    exit 1
}
# Rehearsal settings (RLBOX_REHEARSAL, a space-separated list; `rlbox rehearse` sets it):
#   no-custom-kernels   vllm-ascend builds without its custom kernels (they need the CANN compiler)
rlbox_rehearsal() { case " ${RLBOX_REHEARSAL:-} " in *" $1 "*) return 0 ;; esac; return 1; }
