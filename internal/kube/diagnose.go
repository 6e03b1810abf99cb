package kube

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/podvm/podvm/internal/driver"
)

// This file is how a pod's trouble becomes an error: its status read for
// the reason a container could not start, and the retries that wait for it.

// retry calls attempt until it succeeds or fails for good (again false),
// while pod id may still get where attempt wants it: a failure that the
// pod's status explains is returned as that, one that the API server
// refuses for good (forbidden) at once, and others are tried again every
// retryEvery for the first retryFast tries, which a pod that starts at
// once needs, and every retrySlow after (an image being pulled, a pod
// waiting for a node: each try goes through the API server to the
// kubelet). The status is read every statusEvery at most: the kubelet
// reports a container's trouble at its relist, a second apart, while an
// attach reaches a container the moment it runs.
func (d *Driver) retry(ctx context.Context, id, what string, attempt func() (again bool, err error)) error {
	var p *corev1.Pod
	var read time.Time
	for tries := 1; ; tries++ {
		again, err := attempt()
		if err == nil || !again || apierrors.IsForbidden(err) || apierrors.IsUnauthorized(err) || ctx.Err() != nil {
			return err
		}
		if time.Since(read) >= statusEvery {
			var gerr error
			p, gerr = d.c.CS.CoreV1().Pods(d.o.Namespace).Get(ctx, id, metav1.GetOptions{})
			read = time.Now()
			switch {
			case gerr != nil:
				return classify("get pod", id, gerr)
			case failure(p) != nil:
				return failure(p)
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("vm: kube: %s (pod %s, %s): %w (last: %v)", what, id, describe(p), ctx.Err(), err)
		case <-time.After(pause(tries)):
		}
	}
}

// pause is retry's pause after its tries-th attempt.
func pause(tries int) time.Duration {
	if tries <= retryFast {
		return retryEvery
	}
	return retrySlow
}

// retry's pauses between attempts, and how often at most it reads the
// pod's status.
const (
	retryEvery  = 25 * time.Millisecond
	retryFast   = 60 // 1.5 s of pauses, and the tries' own time
	retrySlow   = 200 * time.Millisecond
	statusEvery = 250 * time.Millisecond
)

// diagnose returns why pod id's container ended before the agent's
// handshake, as its status says once the kubelet has reported it
// (diagnoseWait at most), or err, what the stream said, when it says
// nothing.
func (d *Driver) diagnose(id string, err error) error {
	ctx, cancel := context.WithTimeout(context.Background(), diagnoseWait)
	defer cancel()
	for {
		p, gerr := d.c.CS.CoreV1().Pods(d.o.Namespace).Get(ctx, id, metav1.GetOptions{})
		if gerr == nil {
			if f := failure(p); f != nil {
				return fmt.Errorf("%w (the agent's stream: %v)", f, err)
			}
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// diagnoseWait bounds [Driver.diagnose]'s wait for the kubelet's report
// (it reports a container's exit at its next relist, a second apart). A
// variable for the tests.
var diagnoseWait = 10 * time.Second

// status returns the status of container name, or nil.
func status(list []corev1.ContainerStatus, name string) *corev1.ContainerStatus {
	for i := range list {
		if list[i].Name == name {
			return &list[i]
		}
	}
	return nil
}

// imageReasons are the kubelet's reasons for a container waiting on an
// image it does not have and may not, or cannot, pull.
var imageReasons = map[string]bool{"ErrImageNeverPull": true, "ErrImagePull": true, "ImagePullBackOff": true, "InvalidImageName": true}

// startReasons are the kubelet's reasons for a container it could not
// make or start.
var startReasons = map[string]bool{"CreateContainerConfigError": true, "CreateContainerError": true, "RunContainerError": true, "CrashLoopBackOff": true}

// failure says why pod p will not get where a wait wants it, or nil while
// it may.
func failure(p *corev1.Pod) error {
	if p.DeletionTimestamp != nil {
		return fmt.Errorf("%w: kube: pod %s is being deleted", driver.ErrContainerNotRunning, p.Name)
	}
	all := append(append([]corev1.ContainerStatus(nil), p.Status.InitContainerStatuses...), p.Status.ContainerStatuses...)
	for _, st := range all {
		if err := missingProgram(p.Name, st); err != nil {
			return err
		}
		if w := st.State.Waiting; w != nil {
			switch {
			case imageReasons[w.Reason]:
				return fmt.Errorf("%w: kube: pod %s: %s: %s", driver.ErrImageNotFound, p.Name, w.Reason, w.Message)
			case startReasons[w.Reason]:
				return fmt.Errorf("%w: kube: pod %s: container %s: %s: %s", driver.ErrEngine, p.Name, st.Name, w.Reason, w.Message)
			}
		}
		if t := st.State.Terminated; t != nil {
			switch {
			case st.Name == Main && strings.Contains(t.Message, "podvm: installing the agent"),
				st.Name == Main && strings.Contains(t.Message, "tar: "):
				return fmt.Errorf("%w: kube: pod %s: installing the agent: its container exited %d (%s): %s", driver.ErrEngine, p.Name, t.ExitCode, t.Reason, t.Message)
			case st.Name == Main:
				return fmt.Errorf("%w: kube: pod %s: its container exited %d (%s): %s", driver.ErrContainerNotRunning, p.Name, t.ExitCode, t.Reason, t.Message)
			}
		}
	}
	if p.Status.Phase == corev1.PodFailed || p.Status.Phase == corev1.PodSucceeded {
		return fmt.Errorf("%w: kube: pod %s has ended (%s): %s %s", driver.ErrContainerNotRunning, p.Name, p.Status.Phase, p.Status.Reason, p.Status.Message)
	}
	return nil
}

// missingProgram says that container st of pod podName could not start because
// the image lacks a program podvm's pods run (/bin/sh and sleep for the gate
// and the exec path's scripts, dd and tar for the agent's install, cat
// for the exec path's PID 1), or nil when it is not that.
func missingProgram(podName string, st corev1.ContainerStatus) error {
	var msgs []string
	if w := st.State.Waiting; w != nil && startReasons[w.Reason] {
		msgs = append(msgs, w.Message)
	}
	if t := st.State.Terminated; t != nil && t.ExitCode != 0 {
		msgs = append(msgs, t.Message)
	}
	if t := st.LastTerminationState.Terminated; t != nil {
		msgs = append(msgs, t.Message)
	}
	// runc: exec: "tar": executable file not found in $PATH; crun:
	// executable file `tar` not found in $PATH; either, for a path:
	// exec: "/bin/sh": stat /bin/sh: no such file or directory. The
	// gate's shell, in the container's log: "sh: dd: not found" (ash),
	// "sh: 1: dd: not found" (dash), "dd: command not found" (bash).
	i := slices.IndexFunc(msgs, func(msg string) bool {
		return strings.Contains(msg, "not found in $PATH") || strings.Contains(msg, "exec") && strings.Contains(msg, "no such file or directory") ||
			strings.Contains(msg, ": not found") || strings.Contains(msg, "command not found") || strings.Contains(msg, "podvm: the image lacks")
	})
	if i < 0 {
		return nil
	}
	msg := msgs[i]
	return fmt.Errorf("%w: kube: pod %s: container %s: the image lacks a program podvm's pods run (/bin/sh, sleep, dd, tar, wc, rm and cat): %s", driver.ErrNotSupported, podName, st.Name, msg)
}

// describe says where pod p is, for an error after a wait timed out.
func describe(p *corev1.Pod) string {
	if p == nil {
		return "not seen"
	}
	s := "phase " + string(p.Status.Phase)
	for _, c := range p.Status.Conditions {
		if c.Status != corev1.ConditionTrue && c.Message != "" {
			s += fmt.Sprintf("; %s: %s", c.Type, c.Message)
		}
	}
	return s
}
