
(function(){
  "use strict";
  function cell(tr,i){return tr.cells[i];}
  function key(td){
    if(td.hasAttribute("data-null")) return null;
    var v=td.getAttribute("data-v");
    if(v!==null){var n=Number(v); return isNaN(n)?v:n;}
    return td.textContent.toLowerCase();
  }
  function compare(a,b,dir){
    if(a===null&&b===null) return 0; if(a===null) return 1; if(b===null) return -1;
    if(typeof a===typeof b) return (a<b?-1:a>b?1:0)*dir;
    return (typeof a==="number"?-1:1)*dir;
  }
  function sortTable(table,i){
    var th=table.tHead.rows[0].cells[i];
    var dir=th.getAttribute("aria-sort")==="ascending"?-1:1;
    Array.prototype.forEach.call(table.tHead.rows[0].cells,function(h){h.setAttribute("aria-sort","none");});
    th.setAttribute("aria-sort",dir===1?"ascending":"descending");
    var body=table.tBodies[0];
    var rows=Array.prototype.map.call(body.rows,function(tr,k){return [key(cell(tr,i)),k,tr];});
    rows.sort(function(x,y){return compare(x[0],y[0],dir)||x[1]-y[1];});
    rows.forEach(function(r){body.appendChild(r[2]);});
  }
  function filterTable(table,text,count){
    var q=text.trim().toLowerCase(), shown=0, rows=table.tBodies[0].rows;
    for(var k=0;k<rows.length;k++){
      var hit=q===""||(rows[k].getAttribute("data-search")||"").indexOf(q)>=0;
      rows[k].hidden=!hit; if(hit) shown++;
    }
    if(count) count.textContent=shown+" of "+rows.length+" rows";
  }
  document.querySelectorAll("table.sortable").forEach(function(table){
    Array.prototype.forEach.call(table.tHead.rows[0].cells,function(th,i){
      th.tabIndex=0; th.setAttribute("aria-sort","none");
      th.addEventListener("click",function(){sortTable(table,i);});
      th.addEventListener("keydown",function(e){if(e.key==="Enter"){sortTable(table,i);}});
    });
  });
  document.querySelectorAll("input.filter").forEach(function(input){
    var table=document.getElementById(input.getAttribute("data-table"));
    var count=document.getElementById(input.getAttribute("data-table")+"-count");
    input.addEventListener("input",function(){filterTable(table,input.value,count);});
    filterTable(table,input.value,count);
  });
  document.querySelectorAll("input.allcols").forEach(function(box){
    var table=document.getElementById(box.getAttribute("data-table"));
    box.addEventListener("change",function(){table.classList.toggle("hide-extra",!box.checked);});
  });
  document.documentElement.setAttribute("data-wbfe-ready",String(document.querySelectorAll("table.sortable").length));
})();
