"""Images and Videos tabs against the real generation stage (dev checkpoint)."""

from __future__ import annotations

import httpx

from tests.e2e.conftest import open_tab, require_surface, screenshot


def test_image_appears_with_its_curl(page, playground) -> None:
    require_surface(playground, "images")
    open_tab(page, playground, "images")
    form = page.locator("#images-form")
    form.locator("textarea[name=prompt]").fill("a blue sphere on sand")
    form.locator("select[name=size]").select_option("64x64")
    form.locator("input[name=steps]").fill("2")
    form.locator("input[name=seed]").fill("7")
    curl = page.locator("#images-curl")
    assert '"num_inference_steps":2' in curl.inner_text()  # curl follows the form as it is edited
    form.locator("button[type=submit]").click()

    image = page.locator("#images-output")
    image.wait_for(state="visible", timeout=60_000)
    size = page.evaluate(
        "() => { const i = document.querySelector('#images-output');"
        " return [i.naturalWidth, i.naturalHeight, i.complete]; }"
    )
    assert size == [64, 64, True]
    image_id = image.get_attribute("data-image-id")
    content = httpx.get(f"{playground.base_url}/v1/images/{image_id}/content", timeout=10)
    assert content.status_code == 200 and content.headers["content-type"].startswith("image/")
    text = curl.inner_text()
    assert text.startswith(f"curl -sS -X POST '{playground.base_url}/v1/images/generations'")
    assert '"prompt":"a blue sphere on sand"' in text and '"size":"64x64"' in text
    assert page.locator("#images-form .error").is_hidden()
    screenshot(page, "images")
    assert page.errors == []


def test_video_job_progress_player_and_delete(page, playground) -> None:
    require_surface(playground, "videos")
    open_tab(page, playground, "videos")
    # Record every progress value the bar shows, to check that it followed the job.
    page.evaluate("""() => {
        window.progressSeen = [];
        const bar = document.querySelector('#videos-progress');
        new MutationObserver(() => window.progressSeen.push(bar.value))
            .observe(document.querySelector('#videos-status'),
                     {childList: true, characterData: true, subtree: true});
    }""")
    form = page.locator("#videos-form")
    form.locator("textarea[name=prompt]").fill("waves on a beach")
    form.locator("select[name=size]").select_option("64x64")
    form.locator("input[name=num_frames]").fill("9")
    form.locator("input[name=fps]").fill("8")
    form.locator("input[name=steps]").fill("3")
    form.locator("button[type=submit]").click()

    page.wait_for_selector("#tab-videos[data-job-status=completed]", timeout=120_000)
    assert page.locator("#videos-progress").evaluate("b => b.value") == 100
    seen = page.evaluate("window.progressSeen")
    assert seen[-1] == 100 and seen == sorted(seen), seen
    duration = page.wait_for_function(
        "() => { const v = document.querySelector('#videos-player');"
        " return !v.hidden && v.readyState >= 1 && isFinite(v.duration) && v.duration > 0 && v.duration; }",  # noqa: E501
        timeout=30_000,
    ).json_value()
    assert 0.5 < duration < 3  # 9 frames at 8 fps
    job_id = page.evaluate("JSON.parse(document.querySelector('#videos-job').textContent).id")
    screenshot(page, "videos")

    page.locator("#videos-delete").click()
    page.wait_for_selector("#tab-videos[data-job-status=deleted]")
    assert page.locator("#videos-player").is_hidden()
    gone = httpx.get(f"{playground.base_url}/v1/videos/{job_id}", timeout=10)
    assert gone.status_code == 404
    assert page.errors == []
