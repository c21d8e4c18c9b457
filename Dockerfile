# The course as a container image, for JupyterHub, Binder (repo2docker) or `docker run`.
#
#   docker build -t relevance-lab .
#   docker run --rm -p 8888:8888 relevance-lab        # then open the URL it prints
#
# It installs exactly as CI does: `make install` (the Makefile's pip commands: the pinned
# torch pair first, then the project with its dev extras into .venv). The only addition
# is HUB_PACKAGES, what a hub or Binder needs to start a server: JupyterHub's
# `jupyterhub-singleuser` and the `notebook` package; match jupyterhub's major version to
# your hub's (--build-arg HUB_PACKAGES="jupyterhub==5.* notebook"), or set it to "" for plain
# `docker run`. docs/TEACHING.md has the recipes.
FROM python:3.11-slim

ARG NB_USER=jovyan
ARG NB_UID=1000
ENV USER=${NB_USER} \
    HOME=/home/${NB_USER} \
    LAB=/opt/relevance-lab

# make drives the install; a user with uid 1000 as Binder and most hubs expect
RUN apt-get update \
 && apt-get install -y --no-install-recommends make \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --create-home --shell /bin/bash --uid ${NB_UID} ${NB_USER} \
 && mkdir -p ${LAB} && chown ${NB_UID} ${LAB}

WORKDIR ${LAB}
COPY --chown=${NB_UID} . ${LAB}
USER ${NB_USER}

RUN make install PYTHON=python3 && rm -rf ${HOME}/.cache/pip

ARG HUB_PACKAGES="jupyterhub notebook"
RUN if [ -n "${HUB_PACKAGES}" ]; then \
      .venv/bin/python -m pip install --no-cache-dir --disable-pip-version-check -q \
        -c requirements-torch.txt ${HUB_PACKAGES}; \
    fi

# The venv first on PATH (Binder and hubs call `jupyter` / `jupyterhub-singleuser` by name);
# one torch thread per kernel on a shared server; DINOv2's converted weights cached in the
# image, so no learner converts them again.
ENV PATH=${LAB}/.venv/bin:${PATH} \
    OMP_NUM_THREADS=1 \
    RELEVANCE_LAB_CACHE=${LAB}/.cache/relevance-lab
RUN python -m lrp_core.tools.doctor --quick \
 && python -c "from lrp_core.models import load; load('dinov2-s14'); load('dinov2-scenes')"

EXPOSE 8888
CMD ["make", "lab", "LAB_ARGS=--ip 0.0.0.0 --port 8888 --no-browser"]
