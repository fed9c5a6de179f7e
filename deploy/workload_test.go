package deploy_test

import "github.com/compass-runner/identity/deploy/deploytest"

// renderedPod is deploytest.RenderedPod: a rendered workload's pod template.
var renderedPod = deploytest.RenderedPod
