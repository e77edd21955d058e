# Sourced at the start of every RUN that reaches the network (rlbox templates).
# The CA bundle comes in as a BuildKit secret (`rlbox build --ca-bundle FILE`), mounted at
# /run/secrets/ca for that one RUN only: it never lands in a layer.
if [ -s /run/secrets/ca ]; then
    export PIP_CERT=/run/secrets/ca GIT_SSL_CAINFO=/run/secrets/ca SSL_CERT_FILE=/run/secrets/ca \
        REQUESTS_CA_BUNDLE=/run/secrets/ca CURL_CA_BUNDLE=/run/secrets/ca
fi
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore
